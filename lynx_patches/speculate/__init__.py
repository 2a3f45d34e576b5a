"""Decode on the anchor, verify against full precision, roll back (``--lynx-mode lynx``)."""
