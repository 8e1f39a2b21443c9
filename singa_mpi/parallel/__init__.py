"""Running a partition plan with one worker per MPI rank."""
