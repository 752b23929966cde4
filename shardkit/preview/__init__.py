"""``shardkit show``: a self-contained HTML page of a dataset's samples and statistics.

:mod:`.draw` picks samples and reads them as stored, :mod:`.fields` renders
one field (escaped, sizes checked first), :mod:`.stats` the statistics and
plots, :mod:`.page` the page around them, :mod:`.build` puts them together
over an opened dataset (the reader's ``_repr_html_`` calls it) and
:mod:`.api` opens datasets: :func:`shardkit.show` and the command. The
package is not named ``show``, so that ``shardkit.show`` stays the function.
"""
