"""chatui's widgets: prompt box, message views, token view, inspector, status bar.

Importing the package applies :mod:`.strip_cycles` (Textual strips without self-references),
which keeps the garbage collector's pauses short while replies stream.
"""

from . import strip_cycles

strip_cycles.apply()
