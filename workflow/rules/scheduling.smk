# How jobs are scheduled, cached and grouped: priorities, threads, the between-workflow cache, the cluster's groups,
# and a workaround for a timer Snakemake leaves behind. Values measured on the benchmarks (docs/snakemake.md).
import threading

# Between-workflow cache of the per-part convert and compile jobs (docs/cluster.md). "omit-software": this workflow
# deploys no conda env or container; what built an output is the tool_version param instead. Snakemake refuses
# benchmark: on a cacheable rule, so those rules have none.
CACHE_PER_PART = "omit-software"
# The cache key hashes params but not wildcards: without the part in a param, parts could share one entry
# (docs/snakemake.md, "Between-workflow cache").
CACHE_KEY_PART = "{part}"
# No convert starts before both graphs are split and sliced (part_labels), so those jobs go before other ready ones
# (the shared-weights check, the chain == full checks), which nothing waits for until the bundle.
CRITICAL_PATH = 10
# A unit of the calibration chain holds every core, and the chain is the longest path of a build that has one:
# Snakemake weighs the priorities of the jobs it could start together, so a unit must outweigh any set of other
# jobs that would fill the cores instead (two checks beside each other outweighed CRITICAL_PATH).
CHAIN_FIRST = 100
# ... and takes every core on a box of two (aimet-onnx's session; the converts wait, as the next unit goes first),
# every core but one on a larger box, where finished parts' converts and compiles then run beside the chain.
# A cluster executor needs no --cores (each job is its own allocation): there a unit asks for the two cores it was
# measured on, which the profile's set-threads can raise.
_CORES = workflow.resource_settings.cores
CHAIN_THREADS = max(min(_CORES, 2), _CORES - 1) if _CORES else 2
# A check of a second that can refuse the whole build (the host run's prompt) before anything else that is ready.
QUICK_REFUSALS = CHAIN_FIRST + 1
# Then the whole-model checks (check_model, verify_split: 5-12 s each, against 1-3 s for a per-part job): left to
# Snakemake's own order they ran last, one alone on a core while the other idled and the bundle waited for it.
LONG_CHECKS = 5
# On a cluster, one submission per part holds its converts, compiles and accounts (no effect on local runs).
GROUP_PER_PART = "part_{part}"


def cancel_rescheduling_timers():
    """Cancel the re-evaluation timers Snakemake's scheduler leaves behind, once the run is over.

    After every round that starts jobs, Snakemake 9 arms a one-second, non-daemon ``threading.Timer`` to look at
    the queue again (scheduling/job_scheduler.py, ``_schedule_reevalutation``, armed for the job rate limiter that
    ``--max-jobs-per-timespan`` sets up, 100/1s by default). The interpreter waits for the last one before it exits,
    so every run that ran a job ended up to a second after its last job (1.0 s of an 11 s incremental build). Run
    as the onsuccess/onerror hook, when no job is left to schedule; a Timer that is cancelled exits at once and
    never calls its function."""
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.cancel()


onsuccess:
    cancel_rescheduling_timers()


onerror:
    cancel_rescheduling_timers()
