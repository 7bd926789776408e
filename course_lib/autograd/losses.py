"""The loss of micrograd's moons demo, for chapter 01's networks."""


def svm_loss(model, X, y):
    """The mean max-margin loss of the model on the points X with labels y in {-1, +1}."""
    scores = [model([float(a) for a in row]) for row in X]
    losses = [(1 - float(yi) * s).relu() for yi, s in zip(y, scores)]
    return sum(losses) * (1.0 / len(losses))
