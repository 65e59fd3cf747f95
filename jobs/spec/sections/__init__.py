"""The job spec's fields, one frozen dataclass per section (model and data, method, trainer options,
memory, training, run), each field with its help text, form group and bounds next to it.

The YAML/JSON stays flat: the sections only group the declarations; `jobs.spec.job.JobSpec`
inherits all of them, so every field keeps its own name.
"""
