"""Op-level and module-level suites: declarative YAML (conf/suites/*.yaml) expanded into cases
(spec), run in isolated long-lived workers (pool, worker, execute), diffed (diff), summarised into
a coverage matrix (coverage, render). Light modules (spec, pool, diff, coverage, render, cli) never
import torch; only the worker processes do (execute, testops).
"""
