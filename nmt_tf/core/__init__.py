"""The ground floor: files and their errors, the model directory's layout and
its checkpoints, the machine (CPU flags, precision), the settings' fields and
the tools' quiet start-up. Imports nothing else of nmt_tf."""
