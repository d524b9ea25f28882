"""Packing: small files into WebDataset tar or Parquet shards with a hashed index, and back.

    pack / migrate --pack   job.plan_pack -> units (one per shard, then index, then manifest)
    unpack                  unpack.unpack: every member checked before any file is written
    cat                     reading.cat: the index, the shard's list, one ranged read
    verify                  index.check: a manifest's ``shard_sets`` entry against the store

The layout of a shard set is in ``layout``; the index document in ``index``; the steps of writing
one shard in ``writer`` (formats in ``tarfmt`` and ``parquetfmt`` only encode). Nothing here
imports pyarrow until a Parquet shard is written or read.

Shard size: 64 MiB - 1 GiB (default 256 MiB). Smaller shards mean more requests and more
per-object overhead for every reader and lister; bigger ones mean coarse shuffling, long
retries of a failed shard and slow first batches. The peers sit in the same range: WebDataset
suggests shards of a few hundred MB, MosaicML Streaming defaults to 64 MB, TFRecord guidance is
100-200 MB, and Parquet readers work best with row groups of tens to hundreds of MB.
"""
