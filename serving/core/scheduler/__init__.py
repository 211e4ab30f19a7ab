"""Stage scheduling policies behind one interface (DESIGN §5)."""

from serving.core.scheduler.base import Policy, Scheduler, SchedulerConfig, create_scheduler

__all__ = ["Policy", "Scheduler", "SchedulerConfig", "create_scheduler"]
