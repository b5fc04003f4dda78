"""Adapters behind the ports: policy engines (Cedar, external ABAC), decision,
claim and checkpoint stores, shared canary slots."""
