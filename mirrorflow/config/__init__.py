"""Flow definitions: MirrorMaker 2 properties and YAML files, config providers, the topology
model (clusters, flows, MM2's layering and defaults) and whole-topology validation."""
