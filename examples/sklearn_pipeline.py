"""The scikit-learn estimator in a `Pipeline`, tuned with `GridSearchCV`.

`DeepEnsembleClassifier` is an ordinary scikit-learn classifier: here it follows a feature
selection step, and a grid search picks its learning rate and width by cross-validation
(fits of the same architecture reuse the traced graphs, so each fit is fast).
Run: `python examples/sklearn_pipeline.py [--members 4] [--epochs 20]`.
"""
import argparse


def main() -> None:
    from sklearn.datasets import load_breast_cancer
    from sklearn.feature_selection import SelectKBest
    from sklearn.model_selection import GridSearchCV, train_test_split
    from sklearn.pipeline import Pipeline

    from ensemble.sklearn import DeepEnsembleClassifier

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--folds", type=int, default=3)
    p.add_argument("--small", action="store_true", help="a 2-point grid (a smoke run)")
    args = p.parse_args()

    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0,
                                                        stratify=y)
    pipe = Pipeline([("select", SelectKBest(k=15)),
                     ("ensemble", DeepEnsembleClassifier(n_members=args.members,
                                                         epochs=args.epochs, dropout=0.0,
                                                         random_state=0))])
    space = {"ensemble__learning_rate": [1e-3, 1e-2], "ensemble__hidden": [(16,), (32,)]}
    if args.small:
        space = {"ensemble__learning_rate": [1e-3, 1e-2]}
    grid = GridSearchCV(pipe, space, cv=args.folds, scoring="neg_log_loss")
    grid.fit(X_train, y_train)
    print("best:", grid.best_params_, f"cv log loss {-grid.best_score_:.4f}")
    best = grid.best_estimator_
    print(f"test accuracy {best.score(X_test, y_test):.3f}")
    members = best.named_steps["ensemble"].predict_members(
        best.named_steps["select"].transform(X_test))
    print("members' probabilities:", members.shape, "[n_members, n_rows, n_classes]")


if __name__ == "__main__":
    main()
