"""What trains: a harness's segment of GRPO on a policy, in a worker process.

    jobs.py         the worker entry points (train_segment, train_schedule) and what their
                    callers hand them (handed_draws, the seeds)
    outputs.py      what a job leaves, vetted before the trusted side reads or keeps it
                    (the run's checkpoint schedule, the records' shapes, the log kept beside it)
    run.py          `evotrainer train`: one segment in a worker, then the evaluator
    pretrain.py     the cached SFT base of the built-in model
    backends.py     who trains a segment: the registry (embedded, trl) and its refusals
    grpo.py         the embedded trainer; accumulate, levels, logprobs, optim, segment: its parts
    trl_backend.py  TRL's GRPOTrainer under the harness's slots; trl_mapping.py: knobs to TRL

Nothing is re-exported here: importing `evotrainer.trainer.backends` to check a harness, or
`jobs` to name a job, does not load the trainer itself.
"""
