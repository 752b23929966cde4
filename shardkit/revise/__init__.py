"""Changes to a published dataset: each a new revision over immutable shards.

A dataset is a manifest and a shard table over shards and offset indexes
that never change once written. ``remove`` (:mod:`.remove`) and ``append``
(:mod:`.append`) publish a new revision of that table; they share one way
to do it (:mod:`.publish`): the dataset's folder is held for the whole
change, and the new table and then ``manifest.json`` are published only if
the revision the change was based on is still the one there.
"""
