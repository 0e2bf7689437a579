"""`python -m mt.prepare`: the data's BPE and tokenized cache, without training. The command's old name, kept;
the code is mt/data/prepare.py."""

if __name__ == "__main__":
    from mt.cli import check_command_line
    from mt.config_checks import to_dataclass

    check_command_line("config", check=to_dataclass)  # a bad override or value answers before torch and datasets load
    from mt.data.prepare import main

    main()
