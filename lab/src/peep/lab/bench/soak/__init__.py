"""The ``soak`` section of ``peep bench``: a week of operation in an hour.

The whole system on one machine (PostgreSQL, the shipped Mosquitto, ``peep
serve`` replicas behind the shipped HAProxy, device processes) under steady
load, with faults on a schedule, then a check over the recorded history.
:mod:`.parts` holds the real parts the soak starts, stops, cuts and measures.
"""
