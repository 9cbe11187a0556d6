"""The live fleet topology: recomputed from the store as nodes join and leave, published
(Kubernetes labels, annotations and a ConfigMap; a topology.conf file) only when it
changed. Unlike ``provisioner.topology`` (pure), these modules do I/O."""
