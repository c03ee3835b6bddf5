"""Transports: how templates and requests reach the server (MQTT consumer, gRPC service).

The face others use: :mod:`~peep.server.transport.mqtt` (``MqttBridge``), :mod:`~peep.server.transport.grpc_service`
(``create_server``) and :mod:`~peep.server.transport.follow` (``EventFollower``: a replica following the events
others committed). ``limits``, ``mqtt_devices``, ``mqtt_device_models``, ``homeassistant`` (Home Assistant's
discovery), ``homeassistant_recent`` (its cameras' counts) and ``homeassistant_people`` (the entities of the people
who opted in) are the transports' own. Each module's
``__all__`` names what it offers; anything else is the module's own (``tests/server/test_public_faces.py``).
"""

__all__ = ["follow", "grpc_service", "mqtt"]
