"""``shardkit index``: make published tar shards a shardkit dataset where they are.

Each shard is read once, in place, for its offset index; the shard table and
manifest are then published for them, beside the shards or into another
folder. A rerun reads only new or changed shards, and a killed run's rerun
goes on where it stopped.

Modules:

- :mod:`~shardkit.index.indexer`: the driver, :func:`~shardkit.index.indexer.index_dataset`
  and its :class:`~shardkit.index.indexer.IndexOptions`;
- :mod:`~shardkit.index.source`: listing SOURCE's shards, as columns;
- :mod:`~shardkit.index.shard`: indexing one shard (the worker's task);
- :mod:`~shardkit.index.columns`: the per-shard results file and the table written from it;
- :mod:`~shardkit.index.previous`: a previous run's entries, for a rerun;
- :mod:`~shardkit.index.journal`: what a local run keeps so that a rerun after a crash goes on.

Uses ``format/``, ``io/`` and ``write/``'s publishing code; ``write/`` and
``read/`` never import it.
"""
