"""Drawing helpers shared by pages."""
