"""Inside a job: the guard (signals, requeue), a user's program supervised, metrics readers, trackers, the rank launcher."""
