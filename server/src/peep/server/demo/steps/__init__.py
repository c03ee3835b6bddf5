"""The steps of ``peep demo``, each a unit with its own inputs and outputs (the runner lists them)."""
