"""Generated protobuf and gRPC code for the ``peep.v1`` wire format.

Generated from ``proto/peep/v1`` by ``scripts/gen-proto.sh``; never edit by
hand. The ``*_pb2_grpc`` modules need ``grpcio`` (edge and server install it);
the core only uses the ``*_pb2`` messages.
"""
