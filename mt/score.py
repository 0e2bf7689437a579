"""`python -m mt.score`: the model's score of given translations (mt/evaluate/score.py)."""

if __name__ == "__main__":
    from mt.evaluate.score import main

    main()
