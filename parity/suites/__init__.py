"""Op-level and module-level suites: declarative YAML (conf/suites/*.yaml) expanded into cases
(spec), run in isolated long-lived workers (pool, worker, execute) through each provider's runner
(Runner.run_op, the same class and options as the model pipeline), diffed (diff), summarised into
a coverage matrix (coverage, render). Light modules (spec, pool, diff, coverage, render, cli) never
import torch; only the worker processes do (execute, testops).
"""
