"""Read-only analyses over the IR: the torch reference semantics of every op."""
