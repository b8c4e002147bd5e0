"""Training segments and their scores: the one pipeline of training jobs (a cache, a pool of
workers, vetting what they wrote, one evaluator), the search's segments and the schedules
retrained on fresh seeds through it, the segment cache, and the progress of jobs in flight."""
