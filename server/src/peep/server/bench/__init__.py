"""``peep bench``: the core and server sections (the edge section lives in peep.edge.bench)."""
