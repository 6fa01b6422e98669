def main() -> None:  # placeholder until the CLI lands
    raise SystemExit("esopt: CLI not built yet")
