"""`python -m mt.prepare`: the data's BPE and tokenized cache, without training. The command's old name, kept;
the code is mt/data/prepare.py."""

if __name__ == "__main__":
    from mt.cli import check_command_line

    check_command_line("config")  # a bad override answers before torch and datasets load
    from mt.data.prepare import main

    main()
