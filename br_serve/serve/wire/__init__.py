"""What crosses between the rooms: plain-data messages, the event channel from decode
replicas to an ingress replica, and the RPC edges' exception types."""
