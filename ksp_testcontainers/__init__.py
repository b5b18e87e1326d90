"""Start the kafka-share-proxy image beside a Kafka container in your own tests (docs/deployment.md)."""
