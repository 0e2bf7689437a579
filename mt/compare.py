"""`python -m mt.compare`: paired significance between systems. The command's old name, kept; the code is
mt/evaluate/compare.py."""

if __name__ == "__main__":
    from mt.evaluate.compare import main

    main()
