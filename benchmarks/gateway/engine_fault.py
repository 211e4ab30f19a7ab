"""A vLLM engine killed mid-run and started again on its port, for the load test's fault phase (loadtest.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from driver.testbed.engines import Engine


class EngineFault:
    """`start()` arms it: `at_s` seconds later the engine is SIGKILLed (its whole process group, as a crash), then a
    new one is started with the same config (port included) and waited for. `report()`: when each happened (s after
    arming) and the engine now running (`engine`)."""

    def __init__(self, engine: Engine, at_s: float):
        self.engine, self.at_s = engine, at_s
        self.times_s: dict[str, float] = {}
        self.error = ""
        self.thread = threading.Thread(target=self._run, name="engine-fault", daemon=True)

    def start(self) -> None:
        self.armed_s = time.monotonic()
        self.thread.start()

    def _run(self) -> None:
        time.sleep(self.at_s)
        self.engine.kill()
        self.times_s["killed"] = round(time.monotonic() - self.armed_s, 2)
        try:
            self.engine = Engine(replace(self.engine.config)).start().wait_ready()
            self.times_s["ready_again"] = round(time.monotonic() - self.armed_s, 2)
        except (RuntimeError, TimeoutError) as error:
            self.error = str(error)

    def report(self) -> dict:
        return {"at_s": self.at_s, **self.times_s, **({"error": self.error} if self.error else {})}
