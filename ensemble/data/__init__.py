"""Inputs: tables, `.npz` arrays and image folders behind one `Source` protocol; split, preprocessing fitted on train, streaming batches, the export signature's inputs."""
