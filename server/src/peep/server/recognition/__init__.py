"""Recognition: fitting recognisers on perturbed templates, training jobs, the model registry, serving."""
