"""The load generator: the seeds' traffic played against a running Parley over HTTP and SSE.

Open-loop Poisson arrivals (``arrivals``) pick a new or an idle conversation (``workload``) and post a message
with a real streaming client that reads every event (``client``); each request leaves a ``RequestRecord``
(``record``). Beside the client's view the run meters what the service spent: CPU per process (``cpu``),
Kafka records on ``chat.tokens`` (``offsets``), Cassandra statements (``statements``), each hop's time from the
events' own timestamps (``hops``) and the engine's and stages' ``/metrics`` (``scrape``). ``run`` drives one
load; ``report``, ``table`` and ``plot`` turn it into a JSON file, a printed table and a PNG under
``bench-results/loadtest/``. ``parley loadtest`` (``infra/local/loadtest_cli.py``) is the command.
"""
