"""chatui's widgets: prompt box, message views, token view, inspector, status bar.

Importing the package applies chatui's patches to Textual's compositor and strips (where
:mod:`chatui.textual_compat` allows): a frame renders and repaints only what changed, and drawn
lines leave no reference cycles for the garbage collector while replies stream.
"""

from .. import textual_compat

textual_compat.apply()
