# Apple: the Metal implementation beside the CPU runtime (filled in by the Metal work).
