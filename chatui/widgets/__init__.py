"""chatui's widgets: prompt box, message views, token view, inspector, status bar."""
