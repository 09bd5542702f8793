"""The lab's model, below everything that acts on it: the inventory's hosts (``lab.model.inventory``).
Data only, and the standard library only."""
