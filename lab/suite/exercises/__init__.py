"""The reference rank programs: one per exercise, each written the way the tutorials show it."""
