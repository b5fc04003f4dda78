"""The consumer runtime: the pipeline's consumer group, the run of one invocation
chaining the steps in process, recovery from the log, fact delivery and dead letters."""
