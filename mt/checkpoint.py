"""`python -m mt.checkpoint RUN --average-last K`: average a run's last epoch checkpoints. The command's old name,
kept; the code is mt/train/checkpoint.py."""

if __name__ == "__main__":
    from mt.train.checkpoint import main

    main()
