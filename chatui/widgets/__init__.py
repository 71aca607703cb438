"""chatui's widgets: prompt box, message views, token view, inspector, status bar.

Importing the package applies two patches to Textual: :mod:`.strip_cycles` (strips without
self-references), which keeps the garbage collector's pauses short while replies stream, and
:mod:`.changed_rows` (a partial screen update renders only the rows it changes).
"""

from . import changed_rows, strip_cycles

strip_cycles.apply()
changed_rows.apply()
