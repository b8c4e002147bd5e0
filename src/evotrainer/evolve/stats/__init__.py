"""Statistics that decide: paired seeds and t intervals, the promotion gate, the final
comparison. Pure functions over plain numbers: no process, file or clock."""
