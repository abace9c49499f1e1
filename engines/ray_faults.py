"""Crashed Ray workers in Flower's Simulation Engine: replaced, or the run stopped - never silently reused.

Flower 1.42's Ray backend (``flwr/server/superlink/fleet/vce/backend/raybackend.py``) runs each message on
an actor of a pool (``BasicActorPool``) and, when the task fails, puts the actor back into the pool whatever
the failure was. When the actor's process died (``os._exit``, a segfault, the OOM killer) Ray does not
restart it by default (``max_restarts=0``), so the dead actor stays in the pool and every later message it
is given fails at once with ``ActorDiedError``; the pool takes the most recently returned actor first, so
after one crash most of the federation's messages go to the dead one.

Two cases:

- ``noniid-fl run --engine ray`` / ``simulate(engine='ray')`` (:func:`engines.ray.run_ray`): the actors are
  created with :data:`ACTOR_FAULT_TOLERANCE`, passed through Flower's ``client_resources`` backend config
  (Flower hands that dict to Ray's ``ClientAppActor.options(...)``): Ray restarts a crashed actor in a new
  worker process (``max_restarts=-1``) and runs the message it was running once more there
  (``max_task_retries=1``; a message sent to an actor while it restarts waits for it). A one-off crash (a
  transient OOM kill) therefore costs time but not the update; a crash that repeats fails that client for
  that round only. Its error reply (Flower: code 0, Ray's ``ActorUnavailableError``) is rewritten by
  :class:`server_app.worker_watch.WorkerWatchGrid` into code 8 (``CLIENT_APP_CRASHED``, as the in-process worker pool reports a
  dead worker) with a reason that says what happened.
- ``flwr run .`` (Flower's simulation SuperLink): its federation config carries only the CPUs/GPUs per
  client, so the actors cannot be made restartable, and a crash leaves a dead actor in the pool. The first
  ``ActorDiedError`` reply makes the ServerApp's ``WorkerWatchGrid`` stop the run (``WorkerLost``, naming the
  client and how to resume) instead of letting later clients fail on the dead worker; ``scripts/run_local.sh``
  then exits 1.

The exit code a run ends with: 0 when every round got at least ``min-train-replies`` usable updates (a
client lost to a crashed worker is a failure of that round, recorded in results.json ``rounds[].failures``
with ``kind='error'`` and its reason, and in run.log); 1 when a round could not complete (too few updates
after ``round-retries``) or the run was stopped by ``WorkerLost``.

The watch on the replies is the ServerApp's (:mod:`server_app.worker_watch`: under ``flwr run .`` no engine of
this project is in the loop); this module holds what the engine side sets: the actors' restart options.
"""

from __future__ import annotations

# Ray actor options for Flower's ClientAppActor (merged into backend_config["client_resources"])
ACTOR_FAULT_TOLERANCE: dict[str, int] = {"max_restarts": -1, "max_task_retries": 1}
