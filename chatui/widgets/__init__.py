"""chatui's widgets: prompt box, message views, token view, inspector, status bar.

Importing the package applies two patches to Textual: :mod:`.strip_cycles` (strips without
self-references), which keeps the garbage collector's pauses short while replies stream, and
:mod:`.partial_updates` (a frame renders and repaints only what changed).
"""

from . import partial_updates, strip_cycles

strip_cycles.apply()
partial_updates.apply()
