"""``shardkit bench``: a dataset's storage ceiling beside its loader's throughput, and what binds (see :mod:`.measure`)."""
