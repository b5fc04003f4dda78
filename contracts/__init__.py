"""Wire contracts of toolexec: topics, event models, the CloudEvent envelope, the
Kafka binding and the E3xxx error registry. No I/O; imports only the standard
library, pydantic and cloudevents.

Modules: `contracts.topics`, `contracts.errors`, `contracts.events`,
`contracts.envelope`, `contracts.kafka_binding`, `contracts.export`.
"""
