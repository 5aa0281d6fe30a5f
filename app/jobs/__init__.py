"""Jobs: images of any size labelled block by block on densecnn's engine (:func:`densecnn.blockwise.predict_to_disk`), in the
background, recorded in a database so that they survive a restart.

- :mod:`.db`: the tables (jobs, API keys) and the database engine.
- :mod:`.store`: reading and changing job records (owner-scoped, claims between worker processes).
- :mod:`.inputs`: where a job's input comes from: an upload streamed to disk, or a path under the data roots.
- :mod:`.multipart`: a job upload's multipart body, streamed to disk under its reservation.
- :mod:`.upload_store`: resumable (tus) uploads, stored until a job takes them.
- :mod:`.admission`: what a job may cost (header guards, parameters, the chunk's memory) before it is recorded.
- :mod:`.quota`: the disk the jobs' files take, reserved before it is written.
- :mod:`.runner`: the bounded executor that runs jobs, reports progress, cancels, resumes and expires them.

API keys (stored hashed) are :mod:`app.keys`.
"""
