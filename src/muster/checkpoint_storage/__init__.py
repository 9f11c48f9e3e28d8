"""Checkpoint storage: where checkpoints go after the harness publishes them locally.

- `base`: the `Backend` contract every storage type implements, and `Location`, a storage
  place described without secrets (what the store keeps per checkpoint);
- `shared_fs`, `s3`: the two backends (S3 through boto3);
- `transfer`: one checkpoint uploaded (files first, each hashed as it streams, metadata.json
  last), fetched back and verified, or deleted (metadata.json first);
- `planner`: which checkpoints Determined's `save_*` policy keeps (pure);
- `retention`: what the cluster config's `retention` removes of ended experiments (pure),
  and `retention_sweep`, which measures, records and removes it;
- `worker`: the server's uploader and garbage collector, off the supervisor's pass.
"""
