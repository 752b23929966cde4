"""The value decoders behind :class:`shardkit.read.decode.Decoder`.

One module per family: :mod:`.images` (PIL images and uint8 tensors),
:mod:`.arrays` (``npy``, ``npz``, webdataset's ``ten``), :mod:`.values`
(text, integers, JSON, msgpack, CBOR and the opt-in pickle / ``torch.load``),
:mod:`.audio` (audio members, whole or as clips) and :mod:`.video` (video
clips, for ``map``), with what the last two share in :mod:`.media`.
Each function takes a field's bytes and returns its value; heavy packages
are imported on first use, so importing these modules costs nothing.
"""
