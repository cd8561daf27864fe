"""ServeLab app: pages, components and the i18n and lesson data they share."""
