import typer

def register(app: typer.Typer) -> None:
    @app.command()
    def demo() -> None:
        """placeholder"""
        from fbt_probe.errors import FbtError
        raise FbtError("x.json: field 'a' expected int")
