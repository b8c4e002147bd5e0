"""The search: which state a trial branches from, crossover and escalation, the population
of elites, the evolving controller's policy, specialists for trials in flight, near misses, and
the lineage read as the search's history. Functions of a view of the run; nothing here trains."""
