"""densecnn in napari: an npe2 plugin (``napari.yaml``, the ``napari`` extra: ``pip install 'densecnn[napari]'``).

- :mod:`~densecnn.napari.widget`: the dock widget (Plugins > densecnn > Label with densecnn);
- :mod:`~densecnn.napari.train_panel`: the Train panel (Plugins > densecnn > Train with densecnn), on
  :mod:`~densecnn.napari.training` (a session of strokes -> model -> live labels, no Qt),
  :mod:`~densecnn.napari.strokes` (strokes and the windows around them) and :mod:`~densecnn.napari.classes`;
- :mod:`~densecnn.napari.engine`: a layer labelled tile by tile under a memory cap, as a generator (no Qt);
- :mod:`~densecnn.napari.source`: which level, axes and channels of a layer the model reads;
- :mod:`~densecnn.napari.models`: the shipped model directories the widget offers;
- :mod:`~densecnn.napari.sample`: the nuclei sample image (File > Open Sample > densecnn).

Importing this package imports neither napari nor Qt; only the widget does.
"""
