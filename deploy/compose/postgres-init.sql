-- One database per service (each has its own job runtime tables); the owner is the
-- POSTGRES_USER the image created.
CREATE DATABASE serentak_upload OWNER serentak;
CREATE DATABASE serentak_notify OWNER serentak;
