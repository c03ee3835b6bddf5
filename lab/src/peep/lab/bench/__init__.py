"""``peep bench``: the core and server sections.

The edge section lives in :mod:`peep.edge.bench`, so that it also runs on a
device where only peep-edge is installed; ``peep bench`` runs it from here
(peep-lab depends on peep-edge).
"""
